"""Synthetic rows from a fitted model's clique tree: forward sampling, one batch at a time.

The generator of AIM and MST runs: it holds only the junction tree's clique marginals (the
run's public state) and the public domain, never data. Each batch is sampled independently
(flat memory for any number of rows): the clique holding the target first, conditioned on
the labels asked for, then every clique given its separator with its parent (breadth first);
components of the tree without the target start from their root clique's marginal. Numbers
are drawn inside their bins (`domain.rows_from_codes`), so the batch leaves as encoded rows
that `TableCodec.decode` writes back to the CSV's columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpsynth.methods.base import Generator, GeneratorState
from dpsynth.methods.marginal.cliquetree import CliqueTree
from dpsynth.methods.marginal.domain import TableDomain, rows_from_codes, table_domain
from dpsynth.methods.marginal.state import unpack_cliques


@dataclass(frozen=True)
class _Step:
    """Sample `new` given `given` (attributes already drawn). `offset_cdf` is the conditional
    CDF [given cells, new cells] with row r shifted by r and flattened: one increasing array,
    so a batch draws by one binary search per row instead of a [batch, new cells] comparison
    (a large clique would otherwise need batch × cells memory)."""

    given: tuple[int, ...]
    new: tuple[int, ...]
    offset_cdf: np.ndarray
    width: int  # new cells


def _conditional(tree: CliqueTree, index: int, given: Sequence[int]) -> _Step:
    factor = tree.factors[index]
    new = tuple(a for a in factor.attrs if a not in given)
    table = factor.sum_to((*given, *new)).values
    sizes = tree.sizes
    rows = int(np.prod([sizes[a] for a in given])) if given else 1
    table = table.reshape(rows, -1)
    totals = table.sum(1, keepdims=True)
    # A separator value the model gives no mass (never drawn in practice) gets uniform rows.
    probabilities = np.where(totals > 0, table / np.where(totals > 0, totals, 1.0), 1.0)
    cdf = np.cumsum(probabilities, axis=1)
    cdf /= cdf[:, -1:]
    cdf += np.arange(rows, dtype=np.float64)[:, None]
    return _Step(tuple(given), new, cdf.reshape(-1), cdf.shape[1])


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

    def sample(self, labels: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Codes [b, d] with the target set to `labels`; `uniform` [b, steps] are U(0, 1)."""
        b = len(labels)
        codes = np.zeros((b, len(self.sizes)), dtype=np.int64)
        codes[:, self.target] = labels
        for k, step in enumerate(self.steps):
            if step.given:
                row = np.ravel_multi_index(
                    tuple(codes[:, a] for a in step.given), [self.sizes[a] for a in step.given]
                )
            else:
                row = np.zeros(b, dtype=np.int64)
            # The first cell whose CDF reaches u, found in row `row`'s shifted block.
            found = np.searchsorted(step.offset_cdf, row + uniform[:, k], side="left")
            pick = np.clip(found - row * step.width, 0, step.width - 1)
            values = np.unravel_index(pick, [self.sizes[a] for a in step.new])
            for a, column in zip(step.new, values, strict=True):
                codes[:, a] = column
        return codes


class MarginalGenerator(Generator):
    """Samples a marginal-based model's clique tree (no data, no network)."""

    def __init__(self, classes: Sequence[str], domain: TableDomain, tree: CliqueTree) -> None:
        self.classes = tuple(classes)
        self.shape = (domain.width,)  # type: ignore[assignment]
        self.device = torch.device("cpu")
        self.domain = domain
        self.tree = tree
        self.sampler = TreeSampler(tree, domain.target)

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
            rows, _ = rows_from_codes(codes, self.domain, uniform[:, steps:])
            yield rows

    def class_proportions(self) -> np.ndarray:
        """The model's own target marginal (public: fitted to noisy measurements only)."""
        counts = np.maximum(self.tree.marginal(self.domain.target), 0.0)
        return counts / counts.sum() if counts.sum() > 0 else np.full(len(counts), 1 / len(counts))
