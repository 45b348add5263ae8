"""Synthetic rows from a fitted model's clique tree: forward sampling, one batch at a time.

The generator of AIM and MST runs: it holds only the junction tree's clique marginals (the
run's public state) and the public domain, never data. Each batch is sampled independently
(flat memory for any number of rows): the clique holding the target first, conditioned on
the labels asked for, then every clique given its separator with its parent (breadth first);
components of the tree without the target start from their root clique's marginal. Each
conditional draw is an inverse-CDF lookup: a guide table finds, in O(1), the first cell a
uniform can land in, and the draw steps on past the few cells whose CDF does not exceed it.

A table's sample takes the codes straight to its columns (`sample_coded`: `CodedRows`, a
level index per categorical column, a number drawn inside its bin per numeric one, as
`domain.rows_from_codes` draws it); `sample` gives the encoded rows of the `Generator`
interface instead (the same codes through `rows_from_codes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpsynth.data.coded_rows import CodedRows
from dpsynth.methods.base import Generator, GeneratorState
from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.domain import (
    TableDomain,
    rows_from_codes,
    scaled_numbers,
    table_domain,
)
from dpsynth.methods.marginal.state import unpack_cliques
from dpsynth.methods.marginal.tails import EndTail, end_tails

# Guide buckets per cell of a conditional table (a power of two ≥ this × its width): with B
# buckets per row a draw steps past (width − 1) / (2B) cells on average. Four per cell up to
# _GUIDE_CELLS cells in all, one beyond (a large AIM clique: memory of the order of its table).
_GUIDE_PER_CELL = 4
_GUIDE_CELLS = 1 << 20
# Rows of a conditional table whose guide is built at once (bounds the temporary memory).
_GUIDE_CHUNK = 1 << 22


@dataclass(frozen=True)
class _Step:
    """Draw `new` given `given` (attributes already drawn). Row r of `cdf` (flattened, `width`
    cells a row) is the CDF of `new`'s cells given the separator's cell r; `guide` (flattened,
    `buckets` a row) holds, for bucket k of row r, the flat index of the first cell whose CDF
    exceeds k / buckets. A uniform u in that bucket lands at or after it, so a draw needs no
    search over the row (a large clique would otherwise need batch × cells memory, or a binary
    search per row)."""

    given: tuple[int, ...]
    given_sizes: tuple[int, ...]
    new: tuple[int, ...]
    new_sizes: tuple[int, ...]
    cdf: np.ndarray
    guide: np.ndarray
    width: int
    buckets: int

    def draw(self, row: np.ndarray | int, uniform: np.ndarray) -> np.ndarray:
        """The cell of each row's conditional (`row`: the separator's cells, 0 without one)
        drawn by its uniform u in [0, 1): the first cell whose CDF exceeds u (exactly the
        inverse CDF; never a cell without mass)."""
        # buckets is a power of two: u · buckets is exact, so u ≥ k / buckets in bucket k
        bucket = (uniform * self.buckets).astype(np.intp)
        bucket += row * self.buckets
        index = self.guide[bucket]  # a copy: the steps below move it on
        need = np.flatnonzero(self.cdf[index] <= uniform)
        while need.size:  # the last cell's CDF is 1 > u: every draw stops inside its row
            index[need] += 1
            need = need[self.cdf[index[need]] <= uniform[need]]
        return index - row * self.width


def _buckets(width: int, cells: int) -> int:
    per_cell = _GUIDE_PER_CELL if cells <= _GUIDE_CELLS else 1
    return 1 << max(0, int(np.ceil(np.log2(width * per_cell))))


def _guide(cdf: np.ndarray, buckets: int) -> np.ndarray:
    """For each row of `cdf` [rows, width] and bucket k, the flat index of the first cell whose
    CDF exceeds k / buckets: the number of cells at or below k / buckets, counted per row
    (exact: the same float comparisons as the draw's)."""
    rows, width = cdf.shape
    dtype = np.int32 if rows * width < 2**31 else np.int64
    guide = np.empty((rows, buckets), dtype=dtype)
    grid = np.arange(buckets, dtype=np.float64) / buckets
    step = max(1, _GUIDE_CHUNK // (width + buckets))
    for begin in range(0, rows, step):
        part = cdf[begin : begin + step]
        n = len(part)
        # a cell is at or below the bucket starts k / buckets from k = (the starts below it) on
        after = np.searchsorted(grid, part, side="left")
        flat = (np.arange(n)[:, None] * (buckets + 1) + after).reshape(-1)
        below = np.bincount(flat, minlength=n * (buckets + 1)).reshape(n, buckets + 1)
        first = np.cumsum(below, axis=1)[:, :buckets]
        guide[begin : begin + n] = first + (begin + np.arange(n))[:, None] * width
    return guide.reshape(-1)


def _conditional(tree: CliqueTree, index: int, given: Sequence[int]) -> _Step:
    factor = tree.factors[index]
    new = tuple(a for a in factor.attrs if a not in given)
    table = np.maximum(factor.sum_to((*given, *new)).values, 0.0)
    sizes = tree.sizes
    rows = int(np.prod([sizes[a] for a in given])) if given else 1
    table = table.reshape(rows, -1)
    totals = table.sum(1, keepdims=True)
    # A separator value the model gives no mass (never drawn in practice) gets uniform rows.
    probabilities = np.where(totals > 0, table / np.where(totals > 0, totals, 1.0), 1.0)
    cdf = np.cumsum(probabilities, axis=1)
    cdf /= cdf[:, -1:]  # the last cell's CDF is exactly 1
    buckets = _buckets(cdf.shape[1], cdf.size)
    return _Step(
        tuple(given),
        tuple(sizes[a] for a in given),
        new,
        tuple(sizes[a] for a in new),
        cdf.reshape(-1),
        _guide(cdf, buckets),
        cdf.shape[1],
        buckets,
    )


class TreeSampler:
    """The sampling order of a clique tree rooted at the target's clique."""

    def __init__(self, tree: CliqueTree, target: int) -> None:
        self.sizes = tree.sizes
        self.target = target
        self.steps: list[_Step] = []
        seen: set[int] = set()
        roots = [tree.home[target]] + [
            i for i in range(len(tree.cliques)) if i != tree.home[target]
        ]
        for root in roots:
            if root in seen:
                continue
            given = (target,) if root == tree.home[target] else ()
            self._add(_conditional(tree, root, given))
            seen.add(root)
            queue = [root]
            while queue:
                i = queue.pop(0)
                for j in tree.neighbours[i]:
                    if j in seen:
                        continue
                    seen.add(j)
                    separator = tuple(a for a in tree.cliques[j] if a in tree.cliques[i])
                    self._add(_conditional(tree, j, separator))
                    queue.append(j)

    def _add(self, step: _Step) -> None:
        # A clique with nothing new to draw (the target's own one-way clique, before any
        # pair is measured) is no step.
        if step.new:
            self.steps.append(step)

    def draw(self, labels: np.ndarray, uniform: Iterable[np.ndarray]) -> np.ndarray:
        """Codes [d, b] (attribute by attribute) with the target set to `labels`; `uniform`
        gives each step's U(0, 1) draws [b] in turn (the rows of an array [steps, b], or drawn
        as they are needed)."""
        b = len(labels)
        codes = np.zeros((len(self.sizes), b), dtype=np.intp)
        codes[self.target] = labels
        for step, draws in zip(self.steps, uniform, strict=True):
            row: np.ndarray | int = 0  # the separator's cell, in C order of `given`
            for a, size in zip(step.given, step.given_sizes, strict=True):
                row = row * size + codes[a]
            pick = step.draw(row, draws)
            if len(step.new) == 1:
                codes[step.new[0]] = pick
                continue
            for a, column in zip(step.new, np.unravel_index(pick, step.new_sizes), strict=True):
                codes[a] = column
        return codes

    def sample(self, labels: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Codes [b, d] with the target set to `labels`; `uniform` [b, steps] are U(0, 1)."""
        return self.draw(labels, np.ascontiguousarray(np.asarray(uniform).T)).T


def coded_rows(
    codes: np.ndarray,
    domain: TableDomain,
    uniform: np.ndarray,
    start: int = 0,
    tails: Mapping[int, tuple[EndTail, ...]] | None = None,
) -> CodedRows:
    """`CodedRows` of codes [d, b]: level indices for categorical attributes, numbers for the
    others from `uniform` [numeric attributes, b] (their positions inside the bins; `tails`,
    by attribute index, how the end bins are drawn)."""
    levels, scaled, absent = {}, {}, {}
    k = 0
    for j, attribute in enumerate(domain.attributes):
        if attribute.kind == "target":
            continue
        if attribute.kind == "categorical":
            levels[attribute.name] = codes[j]
            continue
        scaled[attribute.name], missing = scaled_numbers(
            codes[j], attribute, uniform[k], (tails or {}).get(j, ())
        )
        if missing is not None:
            absent[attribute.name] = missing
        k += 1
    return CodedRows(codes[domain.target], levels, scaled, absent, start)


class MarginalGenerator(Generator):
    """Samples a marginal-based model's clique tree (no data, no network)."""

    def __init__(self, classes: Sequence[str], domain: TableDomain, tree: CliqueTree) -> None:
        self.classes = tuple(classes)
        self.shape = (domain.width,)  # type: ignore[assignment]
        self.device = torch.device("cpu")
        self.domain = domain
        self.tree = tree
        self.sampler = TreeSampler(tree, domain.target)
        self.numbers = sum(a.kind not in ("categorical", "target") for a in domain.attributes)
        # the end bins' tails under the model's own one-way marginals (post-processing)
        self.tails = {
            j: end_tails(a, tree.marginal(j)[: a.present_size])
            for j, a in enumerate(domain.attributes)
            if a.kind == "edges"
        }

    @classmethod
    def from_state(cls, state: GeneratorState) -> MarginalGenerator:
        """The sampler of the saved clique tree (uniform when nothing was fitted yet)."""
        domain = table_domain(state.info, state.config)
        cliques, tables = unpack_cliques("model", state.tensors)
        tree = (
            CliqueTree(domain.sizes, cliques, tables)
            if cliques
            else CliqueTree.independent(domain.sizes, float(state.info.n))
        )
        return cls(state.info.classes, domain, tree)

    def sample_coded(self, labels: np.ndarray, rng: np.random.Generator, start: int) -> CodedRows:
        """The rows of `labels` [b] as `CodedRows` (a table sample's path: no encoded rows),
        drawn with the public `rng`: one uniform per row for each step of the tree, then one
        for each numeric column's position inside its bin."""
        labels = np.asarray(labels, dtype=np.intp)
        b = len(labels)
        codes = self.sampler.draw(labels, (rng.random(b) for _ in self.sampler.steps))
        return coded_rows(codes, self.domain, rng.random((self.numbers, b)), start, self.tails)

    def sample(
        self, labels: torch.Tensor, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """Encoded rows float32 [b, D] for `labels`, in order, at most `batch_size` a batch."""
        labels = labels.cpu()
        width = len(self.sampler.steps) + len(self.domain.attributes)
        for begin in range(0, len(labels), batch_size):
            chunk = labels[begin : begin + batch_size].numpy().astype(np.int64)
            uniform = (
                torch.rand(
                    len(chunk), width, generator=generator, dtype=torch.float64,
                    device=generator.device,
                ).cpu().numpy()
            )  # fmt: skip
            steps = len(self.sampler.steps)
            codes = self.sampler.sample(chunk, uniform[:, :steps])
            rows, _ = rows_from_codes(codes, self.domain, uniform[:, steps:], self.tails)
            yield rows

    def class_proportions(self) -> np.ndarray:
        """The model's own target marginal (public: fitted to noisy measurements only)."""
        counts = np.maximum(self.tree.marginal(self.domain.target), 0.0)
        return counts / counts.sum() if counts.sum() > 0 else np.full(len(counts), 1 / len(counts))
