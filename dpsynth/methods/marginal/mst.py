"""MST (McKenna et al. 2021): one-way marginals, then a maximum spanning tree of pairs.

The winner of the 2018 NIST synthetic-data challenge, generalised: measure every one-way
marginal, fit the independent model, then choose d − 1 pairs that form a spanning tree by
Kruskal's algorithm in which every edge is an exponential-mechanism selection (quality: the
pair's L1 error under the independent model, sensitivity 1), measure those pairs and fit the
tree model with mbi. The budget is split in thirds (one-ways, selection, pairs) as in the
paper, under the fixed PRV schedule of `privacy/marginal_plan.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dpsynth.data.images import DataInfo
from dpsynth.methods.base import PrivacyTarget
from dpsynth.methods.marginal.domain import TableDomain
from dpsynth.methods.marginal.method import MarginalMethod, MarginalTrainer, pairs_within
from dpsynth.methods.marginal.presets import MST_PRESETS


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


class MSTMethod(MarginalMethod):
    """MST on tables: a spanning tree of DP-selected pairs, mbi estimation."""

    name = "mst"
    presets = MST_PRESETS
    table_presets = MST_PRESETS
    description = (
        "MST (maximum spanning tree of DP-selected pair marginals, Gaussian measurements, mbi "
        "estimation); tables only"
    )

    def counts(
        self,
        domain: TableDomain,
        info: DataInfo,
        config: Mapping[str, Any],
        target: PrivacyTarget,
    ) -> tuple[int, int, int]:
        """d one-way measurements and one per tree edge; one selection per edge; 2 rounds."""
        d = len(domain.attributes)
        edges = tree_edges(d, pairs_within(domain, int(config["max_cells"])))
        return d + edges, edges, 2


class MSTTrainer(MarginalTrainer):
    """Round 0: the one-way marginals; round 1: the tree's pairs and the final fit."""

    def run_round(self, step: int) -> None:
        """See the module docstring."""
        d = len(self.sizes)
        if step == 0:
            self.measure([(a,) for a in range(d)])
            self.fit(int(self.config["iters"]))
            return
        pool = pairs_within(self.domain, int(self.config["max_cells"]))
        estimates = self.tree.pair_marginals(pool)
        edges = tree_edges(d, pool)
        forest = Forest(d)
        chosen: list[tuple[int, int]] = []
        for _ in range(edges):
            candidates = [(a, b) for a, b in pool if forest.root(a) != forest.root(b)]
            index = self.select(
                candidates, [estimates[p] for p in candidates], [0.0] * len(candidates)
            )
            a, b = candidates[index]
            forest.join(a, b)
            chosen.append((a, b))
        self.measure(chosen)
        self.fit(int(self.config["final_iters"]))


MSTMethod.trainer_class = MSTTrainer
