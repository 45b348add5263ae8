"""Estimation of the graphical model from noisy marginals, with `mbi` (private-pgm).

`mbi` fits a Markov random field whose marginals best match the noisy measurements
(weighted least squares, mirror descent over the marginal polytope; McKenna et al. 2019).
This module turns our measurements into `mbi.LinearMeasurement`s on a `mbi.Domain` whose
attributes are the table's discrete attributes, runs `mbi.estimation.MirrorDescent` (warm
started from the previous round's potentials), and reads back the calibrated marginals of the
junction tree's maximal cliques as a `CliqueTree` of numpy arrays, which is all that
selection, the run's state and sampling need. Everything here is post-processing of the
noisy measurements: no private data reaches it.

JAX runs in float64 (mbi warns that float32 can stall on large N). Each new set of cliques
compiles a new program (seconds on a CPU), so the mechanisms estimate once per round, not
once per measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsynth.methods.marginal.cliquetree import CliqueTree

Clique = tuple[int, ...]
# The noise std of a weightless measurement: its loss term is ~0 (1e-24 of a unit one).
_WEIGHTLESS = 1e12
# mbi's early stop: a 50-step block improving the loss by less than this fraction, twice.
_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Measurement:
    """A noisy marginal: the clique (sorted attribute indices), counts + noise, and σ."""

    clique: Clique
    values: np.ndarray
    sigma: float


@dataclass(frozen=True)
class Potentials:
    """The log-potentials of a fitted model (for warm starts), as plain arrays."""

    cliques: tuple[Clique, ...]
    tables: tuple[np.ndarray, ...]


def _mbi() -> Any:
    """mbi, imported with JAX in float64 (set before any JAX array exists)."""
    # XLA's default optimisation: its compiled mirror descent runs many times faster than at
    # `--xla_backend_optimization_level=0` (which made the final estimation of aim on
    # german-credit at ε = 10 take 154–721 s instead of 36 s), for a little more compile time
    # per round (bench/results/tuning-tables.md).
    import jax

    jax.config.update("jax_enable_x64", True)
    # mbi compiles many small programs; a persistent cache only fills the disk with them.
    jax.config.update("jax_enable_compilation_cache", False)
    import mbi

    return mbi


def _names(clique: Clique) -> tuple[str, ...]:
    return tuple(f"a{j}" for j in clique)


def _indices(names: Sequence[str]) -> Clique:
    return tuple(int(n[1:]) for n in names)


def estimate(
    sizes: Sequence[int],
    measurements: Sequence[Measurement],
    total: float,
    iters: int,
    warm_start: Potentials | None = None,
) -> tuple[CliqueTree, Potentials]:
    """Fit the model to the measurements (mirror descent, `iters` steps) and return its
    junction-tree marginals (summing to `total`, the public record count) and potentials."""
    mbi = _mbi()
    import jax.numpy as jnp

    domain = mbi.Domain([f"a{j}" for j in range(len(sizes))], [int(s) for s in sizes])
    linear = [
        mbi.LinearMeasurement(np.asarray(m.values, dtype=np.float64), _names(m.clique), m.sigma)
        for m in measurements
    ]
    # The junction tree's maximal cliques join the loss as weightless measurements, so that
    # the fitted model's marginals are the tree's (no second program to compile for them).
    jtree, _ = mbi.junction_tree.make_junction_tree(
        domain, [_names(m.clique) for m in measurements]
    )
    measured = {frozenset(_names(m.clique)) for m in measurements}
    for clique in mbi.junction_tree.maximal_cliques(jtree):
        if frozenset(clique) not in measured:
            cells = int(np.prod([domain[a] for a in clique]))
            linear.append(mbi.LinearMeasurement(np.zeros(cells), tuple(clique), _WEIGHTLESS))
    start = None
    if warm_start is not None and warm_start.cliques:
        tables = {
            _names(c): mbi.Factor(domain.project(_names(c)), jnp.asarray(t))
            for c, t in zip(warm_start.cliques, warm_start.tables, strict=True)
        }
        start = mbi.CliqueVector(domain, list(tables), tables)
    model = mbi.estimation.MirrorDescent().estimate(
        domain,
        linear,
        known_total=float(total),
        iters=int(iters),
        warm_start=start,
        # Stop once a block of steps improves the loss by less than this (relative).
        tol=_TOLERANCE,
    )
    potentials = Potentials(
        tuple(_indices(c) for c in model.potentials.cliques),
        tuple(np.asarray(model.potentials[c].values) for c in model.potentials.cliques),
    )
    return _tree_of(mbi, domain, model, sizes, total), potentials


def _tree_of(mbi: Any, domain: Any, model: Any, sizes: Sequence[int], total: float) -> CliqueTree:
    """The calibrated marginals of the model's junction-tree maximal cliques."""
    jtree, _ = mbi.junction_tree.make_junction_tree(domain, list(model.cliques))
    maximal = [tuple(c) for c in mbi.junction_tree.maximal_cliques(jtree)]
    have = {frozenset(c) for c in model.marginals.cliques}
    if all(frozenset(c) in have for c in maximal):
        # The junction tree's cliques are the model's own: their marginals are calibrated.
        beliefs = model.marginals
    else:  # pragma: no cover - the weightless measurements make them the model's
        expanded = model.potentials.expand(maximal)
        beliefs = mbi.marginal_oracles.message_passing_hugin(expanded, float(total))
    cliques, tables = [], []
    for clique in maximal:
        factor = beliefs.project(clique)
        order = _indices(factor.domain.attributes)
        values = np.asarray(factor.values, dtype=np.float64)
        # Axes in ascending attribute order, as every table here is kept.
        permutation = np.argsort(order)
        cliques.append(tuple(sorted(order)))
        tables.append(np.maximum(np.transpose(values, permutation), 0.0))
    # Attributes in no clique (none: every one-way marginal is measured) stay uniform.
    covered = {a for c in cliques for a in c}
    for a in range(len(sizes)):
        if a not in covered:
            cliques.append((a,))
            tables.append(np.full(int(sizes[a]), float(total) / int(sizes[a])))
    return CliqueTree(sizes, cliques, tables)


def model_size_mb(sizes: Sequence[int], cliques: Sequence[Clique]) -> float:
    """The memory of the junction tree of `cliques` (float64 cells, MB): mbi's
    `hypothetical_model_size` on the public domain."""
    mbi = _mbi()
    domain = mbi.Domain([f"a{j}" for j in range(len(sizes))], [int(s) for s in sizes])
    return float(mbi.junction_tree.hypothetical_model_size(domain, [_names(c) for c in cliques]))
