"""DP-Kernel's generated labels: balanced, or in a table target's public proportions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError


def weighted_labels(count: int, weights: Sequence[float]) -> torch.Tensor:
    """`count` labels in public proportions `weights` (each class at least once), by class.

    Largest-remainder rounding; used for a table whose target declares public `weights`, so
    that the conditional MMD compares generated and data classes of the same mass (balanced
    labels against a 6% class push that class's generated rows apart).
    """
    k = len(weights)
    spare = count - k
    if spare < 0:
        raise UsageError(f"generated_points must be at least the number of classes ({k})")
    exact = [spare * float(w) for w in weights]
    counts = [1 + math.floor(e) for e in exact]
    order = sorted(range(k), key=lambda c: exact[c] - math.floor(exact[c]), reverse=True)
    for c in order[: count - sum(counts)]:
        counts[c] += 1
    return torch.repeat_interleave(torch.arange(k), torch.tensor(counts))


def balanced_labels(count: int, num_classes: int, offset: int) -> torch.Tensor:
    """`count` labels cycling through the classes from `offset` (public, data-independent)."""
    return (torch.arange(count) + offset) % num_classes


def target_weights(info: DataInfo) -> tuple[float, ...] | None:
    """A table target's public class proportions (schema `weights`), or None."""
    if info.modality != "table" or not info.schema:
        return None
    target = next(c for c in info.schema["columns"] if c["name"] == info.schema["target"])
    weights = target.get("weights")
    return tuple(float(w) for w in weights) if weights else None
