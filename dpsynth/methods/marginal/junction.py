"""The junction tree an AIM model is fitted on, grown one measured clique at a time.

The cost of mbi's estimation is the size of the junction tree its message passing runs on
(every mirror-descent step passes messages over every cell of it). mbi builds that tree by a
greedy triangulation of all the measured cliques at once, whose size the selection cannot
predict pair by pair: on census at ε = 10, 41 pairs chosen in one round under a cap of 1.4M
cells (the sum of each pair's own growth) made a tree of 39M cells, and the round did not
finish in 10 minutes. This module builds the tree itself, from the measured cliques in their
order, so that the growth of every candidate pair is known exactly before a selection (AIM's
size filter), and `model.estimate` runs mbi's message passing on this very tree.

Adding a pair (a, b) that no node holds: the nodes holding `a` form a subtree, and so do those
holding `b`. If both lie in one component, take the shortest tree path from a node with `a` to
a node with `b`, and add `a` to every node after the first on it (or `b` to every node before
the last, whichever adds fewer cells): the nodes with `a` stay a connected subtree, so the
running intersection property holds, and a node now holds both. If they lie in different
components, a new node {a, b} joins them. A node that becomes a subset of a neighbour is
merged into it (the tree only shrinks so). A larger clique is added as all its pairs: subtrees
of a tree that meet pairwise share a node (the Helly property), so some node then holds all of
it. Everything here is public structure: the measured cliques and the public domain sizes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence

from dpsynth.methods.marginal.cliquetree import spanning_tree

Clique = tuple[int, ...]


class JunctionTree:
    """A junction tree (forest) over attributes of public sizes; nodes are attribute sets."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        self._nodes: dict[int, frozenset[int]] = {}
        self._links: dict[int, set[int]] = {}
        self._next = 0

    @classmethod
    def of(cls, sizes: Sequence[int], cliques: Iterable[Sequence[int]]) -> JunctionTree:
        """The tree of these cliques, added in order (the same cliques give the same tree)."""
        tree = cls(sizes)
        for clique in cliques:
            tree.add(clique)
        return tree

    @classmethod
    def triangulated(cls, sizes: Sequence[int], cliques: Iterable[Sequence[int]]) -> JunctionTree:
        """The tree of all the cliques at once, as mbi builds it: a greedy elimination order
        (each step eliminates the attribute whose cliques' union has the fewest cells), its
        elimination cliques as nodes, joined by a maximum spanning tree of their
        intersections. For MST's trees of triples this is the tree of the triples; growing
        one pair at a time (`of`) would join each triple's features along a path through the
        target's nodes."""
        tree = cls(sizes)
        current = [frozenset(int(a) for a in c) for c in cliques]
        current = list(dict.fromkeys(c for c in current if c))
        eliminated: list[frozenset[int]] = []
        remaining = sorted({a for c in current for a in c})
        while remaining:
            unions = {a: frozenset().union(*(c for c in current if a in c)) for a in remaining}
            a = min(remaining, key=lambda x: (tree.node_cells(unions[x]), x))
            eliminated.append(unions[a])
            current = [c for c in current if a not in c]
            if len(unions[a]) > 1:
                current.append(unions[a] - {a})
            remaining.remove(a)
        nodes = [c for c in eliminated if not any(c < o for o in eliminated)]
        nodes = list(dict.fromkeys(nodes))
        keys = [tree._new_node(node) for node in nodes]
        for i, j in spanning_tree([tuple(sorted(n)) for n in nodes]):
            tree._links[keys[i]].add(keys[j])
            tree._links[keys[j]].add(keys[i])
        return tree

    # ------------------------------------------------------------------ reading it

    @property
    def cliques(self) -> list[Clique]:
        """The nodes as sorted attribute tuples, in a fixed order."""
        return [tuple(sorted(node)) for node in self._nodes.values()]

    @property
    def edges(self) -> list[tuple[int, int]]:
        """The tree's edges as pairs of indices into `cliques`."""
        index = {key: i for i, key in enumerate(self._nodes)}
        return sorted(
            (index[u], index[v]) for u, linked in self._links.items() for v in linked if u < v
        )

    def node_cells(self, node: frozenset[int]) -> int:
        """The number of cells of a node's table."""
        return math.prod(self.sizes[a] for a in node)

    def cells(self) -> int:
        """The number of cells of all the node tables: the model's size."""
        return sum(self.node_cells(node) for node in self._nodes.values())

    def holds(self, clique: Sequence[int]) -> bool:
        """Whether one node holds every attribute of `clique`."""
        wanted = set(clique)
        return any(wanted <= node for node in self._nodes.values())

    # ------------------------------------------------------------------ growing it

    def growth(self, a: int, b: int) -> int:
        """The cells adding the pair (a, b) would add, before merges (which only remove)."""
        return self._plan(a, b)[0]

    def growths(self, pairs: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
        """`growth` of every pair, with one breadth-first search per first attribute."""
        by_first: dict[int, list[int]] = {}
        for a, b in pairs:
            by_first.setdefault(a, []).append(b)
        holders = self._holders()
        out = {}
        for a, partners in by_first.items():
            order, parent = self._search(holders.get(a, set()))
            for b in partners:
                out[(a, b)] = self._cost(a, b, holders, order, parent)[0]
        return out

    def add(self, clique: Sequence[int]) -> None:
        """Grow the tree until a node holds `clique` (see the module docstring)."""
        clique = sorted(set(int(a) for a in clique))
        holders = self._holders()
        for a in clique:
            if a not in holders:
                self._new_node(frozenset((a,)))
        for i, a in enumerate(clique):
            for b in clique[i + 1 :]:
                self._add_pair(a, b)

    # ------------------------------------------------------------------ internals

    def _new_node(self, node: frozenset[int]) -> int:
        key = self._next
        self._next += 1
        self._nodes[key] = node
        self._links[key] = set()
        return key

    def _holders(self) -> dict[int, set[int]]:
        """For each attribute, the keys of the nodes holding it."""
        holders: dict[int, set[int]] = {}
        for key, node in self._nodes.items():
            for a in node:
                holders.setdefault(a, set()).add(key)
        return holders

    def _search(self, sources: set[int]) -> tuple[list[int], dict[int, int | None]]:
        """Breadth-first order and parents from a set of nodes (ties in key order)."""
        parent: dict[int, int | None] = {key: None for key in sorted(sources)}
        order: list[int] = []
        queue = deque(sorted(sources))
        while queue:
            key = queue.popleft()
            order.append(key)
            for other in sorted(self._links[key]):
                if other not in parent:
                    parent[other] = key
                    queue.append(other)
        return order, parent

    def _cost(
        self,
        a: int,
        b: int,
        holders: dict[int, set[int]],
        order: list[int],
        parent: dict[int, int | None],
    ) -> tuple[int, str, list[int]]:
        """(cells added, how: "none" | "join" | "a" | "b", the path) for the pair (a, b)."""
        with_a, with_b = holders.get(a, set()), holders.get(b, set())
        if with_a & with_b:
            return 0, "none", []
        end = next((key for key in order if key in with_b), None)
        if end is None:
            return self.sizes[a] * self.sizes[b], "join", []
        path = [end]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])  # type: ignore[arg-type]
        path.reverse()  # path[0] holds a, path[-1] holds b, the nodes between hold neither
        add_a = sum(self.node_cells(self._nodes[k]) for k in path[1:]) * (self.sizes[a] - 1)
        add_b = sum(self.node_cells(self._nodes[k]) for k in path[:-1]) * (self.sizes[b] - 1)
        return (add_a, "a", path) if add_a <= add_b else (add_b, "b", path)

    def _plan(self, a: int, b: int) -> tuple[int, str, list[int]]:
        holders = self._holders()
        order, parent = self._search(holders.get(a, set()))
        return self._cost(a, b, holders, order, parent)

    def _add_pair(self, a: int, b: int) -> None:
        _, how, path = self._plan(a, b)
        if how == "none":
            return
        if how == "join":
            holders = self._holders()
            key = self._new_node(frozenset((a, b)))
            for attribute in (a, b):
                other = min(holders[attribute])
                self._links[key].add(other)
                self._links[other].add(key)
        elif how == "a":
            for k in path[1:]:
                self._nodes[k] = self._nodes[k] | {a}
        else:
            for k in path[:-1]:
                self._nodes[k] = self._nodes[k] | {b}
        self._merge_subsets()

    def _merge_subsets(self) -> None:
        """Merge every node that a neighbour contains into that neighbour."""
        merged = True
        while merged:
            merged = False
            for key in list(self._nodes):
                node = self._nodes[key]
                into = next((o for o in sorted(self._links[key]) if node <= self._nodes[o]), None)
                if into is None:
                    continue
                for other in self._links.pop(key):
                    self._links[other].discard(key)
                    if other != into:
                        self._links[other].add(into)
                        self._links[into].add(other)
                del self._nodes[key]
                merged = True
