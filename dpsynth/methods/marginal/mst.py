"""MST (McKenna et al. 2021): one-way marginals, then a maximum spanning tree of pairs.

The winner of the 2018 NIST synthetic-data challenge, generalised: measure every one-way
marginal, fit the independent model, then choose d − 1 pairs that form a spanning tree by
Kruskal's algorithm in which every edge is an exponential-mechanism selection (quality: the
pair's L1 error under the independent model, sensitivity 1), measure those pairs and fit the
tree model with mbi. The budget is split in thirds (one-ways, selection, pairs) as in the
paper, under the fixed PRV schedule of `privacy/accounting/marginal_plan.py`.

With `label_edges` (a preset choice: the target is named by the public schema) the tree
spans the feature columns only and every edge (a, b) is measured together with the target,
as the marginal (a, b, target): the tree-augmented naive Bayes structure of classifier
learning (Friedman et al. 1997), in which the target's Markov blanket is every feature, not
only its neighbours in the tree. An edge's quality is the L1 error of its triple under the
one-way model (sensitivity 1, as MST's). The tree has one edge fewer than MST's (the target
is in every edge, not a node), so σ is a little smaller; a feature that no allowed pair
reaches is measured with the target alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dpsynth.methods.base import PlanFacts
from dpsynth.methods.marginal.domain import TableDomain
from dpsynth.methods.marginal.method import MarginalMethod, pairs_within
from dpsynth.methods.marginal.one_ways import released_one_ways
from dpsynth.methods.marginal.presets import MST_PRESETS
from dpsynth.methods.marginal.trainer import MarginalTrainer


class Forest:
    """Union-find over d attributes: which pairs would join two trees of a spanning forest."""

    def __init__(self, d: int) -> None:
        self.parent = list(range(d))

    def root(self, i: int) -> int:
        """The representative of i's tree (path halving)."""
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(self, a: int, b: int) -> bool:
        """Merge a's and b's trees; False when they were already one."""
        ra, rb = self.root(a), self.root(b)
        if ra == rb:
            return False
        self.parent[ra] = rb
        return True


def tree_edges(d: int, pairs: list[tuple[int, int]]) -> int:
    """How many edges a spanning forest of the allowed pairs has (d − its components)."""
    forest = Forest(d)
    return sum(forest.join(a, b) for a, b in pairs)


def label_edge_pool(domain: TableDomain, max_cells: int) -> list[tuple[int, int]]:
    """The feature pairs (a, b) whose marginal with the target, (a, b, target), has at most
    `max_cells` cells: the edges a `label_edges` tree may use (public: from the domain)."""
    target = domain.target
    return [
        (a, b)
        for a, b in pairs_within(domain, max_cells)
        if target not in (a, b) and domain.cells((a, b, target)) <= max_cells
    ]


def lonely_features(domain: TableDomain, pool: list[tuple[int, int]], max_cells: int) -> list[int]:
    """The features no pair of the pool reaches whose pair with the target fits the cap: a
    `label_edges` tree measures (feature, target) for each of them instead."""
    target = domain.target
    reached = {a for pair in pool for a in pair}
    return [
        a
        for a in range(len(domain.attributes))
        if a != target and a not in reached and domain.cells((a, target)) <= max_cells
    ]


def edge_cliques(domain: TableDomain, config: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """Every marginal a tree may measure after the one-ways: each allowed edge's (the pair,
    or with `label_edges` the pair and the target) and the lonely features' pairs with the
    target (public: from the domain and the config)."""
    max_cells = int(config["max_cells"])
    if not config["label_edges"]:
        return list(pairs_within(domain, max_cells))
    target = domain.target
    pool = label_edge_pool(domain, max_cells)
    lonely = [(a, target) for a in lonely_features(domain, pool, max_cells)]
    return [*((a, b, target) for a, b in pool), *lonely]


class MSTMethod(MarginalMethod):
    """MST on tables: a spanning tree of DP-selected pairs, mbi estimation."""

    name = "mst"
    presets = MST_PRESETS
    table_presets = MST_PRESETS
    description = (
        "MST (maximum spanning tree of DP-selected pair marginals, Gaussian measurements, mbi "
        "estimation); tables only"
    )

    def counts(self, domain: TableDomain, facts: PlanFacts) -> tuple[int, int, int]:
        """d one-way measurements (less those the schema release made) and one per tree edge
        (and, with `label_edges`, one per feature no edge reaches); one selection per edge;
        2 rounds."""
        info, config = facts.info, facts.config
        d, max_cells = len(domain.attributes), int(config["max_cells"])
        ones = d - len(released_one_ways(domain, info, config))
        if not config["label_edges"]:
            edges = tree_edges(d, pairs_within(domain, max_cells))
            return ones + edges, edges, 2
        pool = label_edge_pool(domain, max_cells)
        edges = tree_edges(d, pool)
        return ones + edges + len(lonely_features(domain, pool, max_cells)), edges, 2

    def candidate_cliques(
        self, domain: TableDomain, config: Mapping[str, Any]
    ) -> list[tuple[int, ...]]:
        """The cliques whose exact counts a run may compute: the pairs, or with
        `label_edges` the feature pairs with the target."""
        if not config["label_edges"]:
            return super().candidate_cliques(domain, config)
        target = domain.target
        return [(a, b, target) for a, b in label_edge_pool(domain, int(config["max_cells"]))]

    def first_cliques(
        self, domain: TableDomain, config: Mapping[str, Any]
    ) -> list[tuple[int, ...]]:
        """The trainer's one pass: the one-ways and `edge_cliques`."""
        return [*((a,) for a in range(len(domain.attributes))), *edge_cliques(domain, config)]


class MSTTrainer(MarginalTrainer):
    """Round 0: the one-way marginals; round 1: the tree's pairs and the final fit."""

    def upfront_cliques(self) -> list[tuple[int, ...]]:
        """The one-ways, every edge's marginal and the lonely features' pairs: one pass."""
        return [*super().upfront_cliques(), *edge_cliques(self.domain, self.config)]

    def run_round(self, step: int) -> None:
        """See the module docstring."""
        d = len(self.sizes)
        if step == 0:
            self.measure_one_ways()
            self.fit(int(self.config["iters"]))
            return
        max_cells = int(self.config["max_cells"])
        if self.config["label_edges"]:
            pool = label_edge_pool(self.domain, max_cells)
            estimates = self._triples_under_one_ways(pool)
        else:
            pool = pairs_within(self.domain, max_cells)
            estimates = self.tree.pair_marginals(pool)
        edges = tree_edges(d, pool)
        forest = Forest(d)
        chosen: list[tuple[int, int]] = []
        for _ in range(edges):
            candidates = [(a, b) for a, b in pool if forest.root(a) != forest.root(b)]
            index = self.select(
                [self._edge_clique(p) for p in candidates],
                [estimates[p] for p in candidates],
                [0.0] * len(candidates),
            )
            a, b = candidates[index]
            forest.join(a, b)
            chosen.append((a, b))
        cliques: list[tuple[int, ...]] = [self._edge_clique(p) for p in chosen]
        if self.config["label_edges"]:
            target = self.domain.target
            cliques += [(a, target) for a in lonely_features(self.domain, pool, max_cells)]
        self.measure(cliques)
        self.fit(int(self.config["final_iters"]))

    def _edge_clique(self, pair: tuple[int, int]) -> tuple[int, ...]:
        """The marginal an edge is selected and measured on: the pair, or with the target."""
        return (*pair, self.domain.target) if self.config["label_edges"] else pair

    def _triples_under_one_ways(
        self, pool: list[tuple[int, int]]
    ) -> dict[tuple[int, int], np.ndarray]:
        """Each (a, b, target) marginal of the fitted one-way model (a product of its
        one-way marginals), flattened in that order."""
        target = self.domain.target
        ones = [self.tree.marginal(a) for a in range(len(self.sizes))]
        scale = max(self.tree.total, 1e-300) ** 2
        return {
            (a, b): np.multiply.outer(np.outer(ones[a], ones[b]), ones[target]).reshape(-1) / scale
            for a, b in pool
        }


MSTMethod.trainer_class = MSTTrainer
