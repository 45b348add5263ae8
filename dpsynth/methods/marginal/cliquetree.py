"""A fitted model's junction tree as plain arrays: marginal queries and streamed sampling.

`model.py` estimates the graphical model; what this module keeps of it is the calibrated
marginal of every maximal clique of its junction tree (public: a function of the noisy
measurements only). From those tables alone, with numpy, it answers
- the marginal of any pair of attributes (the exponential mechanism's estimates in AIM's
  selection rounds), by passing the joint of one attribute with each clique's separator along
  the tree;
- batches of synthetic records by forward sampling: the clique holding the target first
  (conditioned on the labels asked for), then every other clique given its separator with
  its parent, each batch independent of the others (flat memory for any number of rows).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Clique = tuple[int, ...]
_LETTERS = string.ascii_letters


@dataclass(frozen=True)
class Factor:
    """A non-negative table over named attributes (axes in the order of `attrs`)."""

    attrs: tuple[int, ...]
    values: np.ndarray

    def sum_to(self, keep: Sequence[int]) -> Factor:
        """The marginal on `keep` (in the order given; every attribute must be present)."""
        keep = tuple(keep)
        index = {a: _LETTERS[i] for i, a in enumerate(self.attrs)}
        formula = "".join(index[a] for a in self.attrs) + "->" + "".join(index[a] for a in keep)
        return Factor(keep, np.einsum(formula, self.values))

    def times(self, other: Factor, keep: Sequence[int]) -> Factor:
        """The product with `other`, summed down to `keep`."""
        keep = tuple(keep)
        names = {a: _LETTERS[i] for i, a in enumerate(dict.fromkeys(self.attrs + other.attrs))}
        formula = (
            "".join(names[a] for a in self.attrs)
            + ","
            + "".join(names[a] for a in other.attrs)
            + "->"
            + "".join(names[a] for a in keep)
        )
        return Factor(keep, np.einsum(formula, self.values, other.values))


def spanning_tree(cliques: Sequence[Clique]) -> list[tuple[int, int]]:
    """A junction tree on maximal cliques: a maximum-weight spanning forest of the graph whose
    edge weights are the cliques' intersection sizes (Kruskal; ties in index order)."""
    edges = sorted(
        (
            (-len(set(a) & set(b)), i, j)
            for i, a in enumerate(cliques)
            for j, b in enumerate(cliques)
            if i < j and set(a) & set(b)
        )
    )
    parent = list(range(len(cliques)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    tree = []
    for _, i, j in edges:
        ri, rj = root(i), root(j)
        if ri != rj:
            parent[ri] = rj
            tree.append((i, j))
    return tree


class CliqueTree:
    """The calibrated marginals of a junction tree's maximal cliques (counts summing to N)."""

    def __init__(self, sizes: Sequence[int], cliques: Sequence[Clique], tables: Sequence) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self.factors = [
            Factor(
                tuple(int(a) for a in c),
                np.asarray(t, dtype=np.float64).reshape([self.sizes[a] for a in c]),
            )
            for c, t in zip(cliques, tables, strict=True)
        ]
        self.cliques = [f.attrs for f in self.factors]
        self.neighbours: list[list[int]] = [[] for _ in self.cliques]
        for i, j in spanning_tree(self.cliques):
            self.neighbours[i].append(j)
            self.neighbours[j].append(i)
        self.home: dict[int, int] = {}
        for i, clique in enumerate(self.cliques):
            for a in clique:
                self.home.setdefault(a, i)
        self.total = float(self.factors[0].values.sum()) if self.factors else 0.0

    @classmethod
    def independent(cls, sizes: Sequence[int], total: float) -> CliqueTree:
        """Every attribute uniform and independent (a model before any measurement)."""
        tables = [np.full(int(s), total / int(s)) for s in sizes]
        return cls(sizes, [(a,) for a in range(len(sizes))], tables)

    def _separator(self, i: int, j: int) -> tuple[int, ...]:
        return tuple(a for a in self.cliques[i] if a in self.cliques[j])

    def joints_with(self, attribute: int) -> dict[int, Factor]:
        """For each clique reachable from the attribute's home clique, the joint marginal of
        the attribute and that clique's attributes (one pass over the tree)."""
        start = self.home[attribute]
        out = {start: self.factors[start]}
        stack = [start]
        while stack:
            i = stack.pop()
            for j in self.neighbours[i]:
                if j in out:
                    continue
                sep = self._separator(i, j)
                keep = tuple(dict.fromkeys((attribute, *sep)))
                message = out[i].sum_to(keep)  # P(attribute, sep)
                child = self.factors[j]
                marginal = child.sum_to(sep).values
                conditional = Factor(
                    child.attrs,
                    np.divide(
                        child.values,
                        _expand(marginal, sep, child.attrs, self.sizes),
                        out=np.zeros_like(child.values),
                        where=_expand(marginal, sep, child.attrs, self.sizes) > 0,
                    ),
                )
                joint_attrs = tuple(dict.fromkeys((attribute, *child.attrs)))
                out[j] = message.times(conditional, joint_attrs)
                stack.append(j)
        return out

    def pair_marginals(self, pairs: Sequence[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """The marginal (counts, flattened in (a, b) order) of every pair (a, b), a < b."""
        by_first: dict[int, list[int]] = {}
        for a, b in pairs:
            by_first.setdefault(a, []).append(b)
        out = {}
        for a, partners in by_first.items():
            joints = None
            for b in partners:
                shared = next((c for c in self.cliques if a in c and b in c), None)
                if shared is not None:
                    factor = self.factors[self.cliques.index(shared)]
                    out[(a, b)] = factor.sum_to((a, b)).values.reshape(-1)
                    continue
                if joints is None:
                    joints = self.joints_with(a)
                home = self.home[b]
                if home in joints:
                    out[(a, b)] = joints[home].sum_to((a, b)).values.reshape(-1)
                else:  # different components: independent
                    pa = self.factors[self.home[a]].sum_to((a,)).values
                    pb = self.factors[home].sum_to((b,)).values
                    out[(a, b)] = (np.outer(pa, pb) / max(self.total, 1e-300)).reshape(-1)
        return out

    def marginal(self, attribute: int) -> np.ndarray:
        """The one-way marginal (counts) of an attribute."""
        return self.factors[self.home[attribute]].sum_to((attribute,)).values


def _expand(table: np.ndarray, attrs: Sequence[int], target: Sequence[int], sizes) -> np.ndarray:
    """`table` over `attrs` broadcast to the axes of `target` (a superset)."""
    order = [a for a in target if a in attrs]
    index = {a: _LETTERS[i] for i, a in enumerate(attrs)}
    moved = np.einsum(
        "".join(index[a] for a in attrs) + "->" + "".join(index[a] for a in order), table
    )
    shape = [sizes[a] if a in attrs else 1 for a in target]
    return moved.reshape(shape)
