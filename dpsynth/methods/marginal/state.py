"""A marginal-based run's state as tensors: measurements, the model's clique tree, potentials.

Everything here is public (noisy measurements and what was fitted to them); the training
loop checkpoints it at step boundaries, so `train --resume` continues with the same
measurements and the same warm start. Lists of cliques and tables are stored flat: cliques as
an int64 matrix padded with -1, tables concatenated with their offsets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

Clique = tuple[int, ...]


def pack_cliques(
    prefix: str, cliques: Sequence[Clique], tables: Sequence[np.ndarray]
) -> dict[str, torch.Tensor]:
    """`prefix/cliques` [k, w] (padded -1), `prefix/values` (concatenated) and
    `prefix/offsets` [k + 1]."""
    width = max((len(c) for c in cliques), default=1)
    matrix = np.full((len(cliques), max(width, 1)), -1, dtype=np.int64)
    for i, clique in enumerate(cliques):
        matrix[i, : len(clique)] = clique
    flat = [np.asarray(t, dtype=np.float64).reshape(-1) for t in tables]
    offsets = np.cumsum([0, *(len(f) for f in flat)]).astype(np.int64)
    values = np.concatenate(flat) if flat else np.zeros(0)
    return {
        f"{prefix}/cliques": torch.from_numpy(matrix),
        f"{prefix}/values": torch.from_numpy(values.astype(np.float64)),
        f"{prefix}/offsets": torch.from_numpy(offsets),
    }


def unpack_cliques(
    prefix: str, tensors: Mapping[str, torch.Tensor]
) -> tuple[list[Clique], list[np.ndarray]]:
    """The inverse of `pack_cliques` (empty lists when the prefix is absent)."""
    if f"{prefix}/cliques" not in tensors:
        return [], []
    matrix = tensors[f"{prefix}/cliques"].cpu().numpy()
    values = tensors[f"{prefix}/values"].cpu().numpy().astype(np.float64)
    offsets = tensors[f"{prefix}/offsets"].cpu().numpy()
    cliques = [tuple(int(a) for a in row if a >= 0) for row in matrix]
    tables = [values[offsets[i] : offsets[i + 1]].copy() for i in range(len(cliques))]
    return cliques, tables
