"""How many records of each class a sample holds (balanced, counts, a table target's weights),
and the labelled batches drawn for them from a generator with the public seed: class by class
for images, in a random order drawn from the seed for a table's rows."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from dpsynth.data.images import DataInfo
from dpsynth.errors import UsageError
from dpsynth.methods.base import Generator

# `sample --labels`'s default: the model's own class proportions for a run whose generator
# fitted them (aim, mst: the target is one of the model's attributes), else balanced.
AUTO_LABELS = "auto"
# The spawn key of the label order's random stream beside the seed ("order" in ASCII): a stream
# of its own, independent of the latents (torch, from the seed), of the table codec's draws
# (numpy's `default_rng(seed)`) and of the partition seeds (spawn keys below 100,000).
_ORDER_KEY = 0x6F72646572


def label_counts(labels: str, n: int, num_classes: int) -> list[int]:
    """Records per class: `balanced` (data-independent, free; also what `auto` means here) or
    per-class COUNTS `a,b,...`.

    Balanced gives each class n // K records and the first n % K classes one more (a table's
    run may also ask for its target's `weights`: see `table_label_counts`).
    """
    if labels in ("balanced", AUTO_LABELS):
        return [n // num_classes + (1 if c < n % num_classes else 0) for c in range(num_classes)]
    try:
        counts = [int(part) for part in labels.split(",")]
    except ValueError:
        raise UsageError(
            f"{{labels}} must be 'balanced' or per-class counts, got {labels!r}",
            parameter="labels",
        ) from None
    if len(counts) != num_classes or min(counts) < 0:
        raise UsageError(
            f"{{labels}} needs {num_classes} non-negative counts (one per class), got {labels!r}",
            parameter="labels",
        )
    if sum(counts) != n:
        raise UsageError(
            f"{{labels}} counts sum to {sum(counts)}, but {{n}} is {n}", parameters=("labels", "n")
        )
    return counts


def weighted_counts(n: int, weights: Sequence[float]) -> list[int]:
    """`n` records split in proportions `weights` (largest remainder; they sum to n)."""
    exact = [n * float(w) / float(sum(weights)) for w in weights]
    counts = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda c: exact[c] - counts[c], reverse=True)
    for c in order[: n - sum(counts)]:
        counts[c] += 1
    return counts


def table_label_counts(labels: str, n: int, info: DataInfo) -> tuple[list[int], str]:
    """Records per class of a table's sample and the rule used, stated in its manifest.

    `weights`: the target's `weights` in the run's schema (declared public or released with DP
    before training: the proportions the generator was trained with); `balanced` (what `auto`
    means for a generator without class proportions of its own: on census it gave dpkernel's
    downstream classifiers a higher ROC-AUC than the true 6% share) or COUNTS as for images.
    """
    schema = info.schema or {}
    target = next((c for c in schema.get("columns", ()) if c["name"] == schema.get("target")), {})
    weights = target.get("weights")
    if labels == "model":
        raise UsageError(
            "{labels} model: only a run of aim or mst fits its own class proportions",
            parameter="labels",
        )
    if labels == "weights":
        if not weights:
            raise UsageError(
                "{labels} weights: the run's schema gives its target no 'weights'",
                parameter="labels",
            )
        source = target.get("weights_source") or "declared public in the schema"
        return weighted_counts(n, weights), f"weights of the target ({source})"
    counts = label_counts(labels, n, len(info.classes))
    return counts, "balanced" if labels in ("balanced", AUTO_LABELS) else "counts (--labels)"


def parse_labels(labels: str, n: int, num_classes: int) -> torch.Tensor:
    """All N labels to generate, class by class (see `label_counts`), as one int64 tensor."""
    counts = label_counts(labels, n, num_classes)
    return torch.repeat_interleave(torch.arange(num_classes), torch.tensor(counts))


def label_chunks(counts: Sequence[int], batch_size: int) -> Iterator[torch.Tensor]:
    """The labels of `parse_labels`, in order, as int64 chunks of at most `batch_size`; memory
    is O(batch_size) whatever the total."""
    label, left = 0, 0
    remaining = sum(counts)
    while remaining > 0:
        size = min(batch_size, remaining)
        parts = []
        need = size
        while need > 0:
            while left == 0:
                left = counts[label]
                label += 1
            take = min(need, left)
            parts.append(torch.full((take,), label - 1, dtype=torch.int64))
            left -= take
            need -= take
        remaining -= size
        yield torch.cat(parts)


def order_rng(seed: int) -> np.random.Generator:
    """The random stream that orders a sample's labels, from the public `seed` (any integer)."""
    sequence = np.random.SeedSequence(entropy=int(seed) % 2**128, spawn_key=(_ORDER_KEY,))
    return np.random.default_rng(sequence)


def shuffled_label_chunks(
    counts: Sequence[int], batch_size: int, seed: int
) -> Iterator[torch.Tensor]:
    """The labels of `counts` (exactly counts[c] of class c) in a uniformly random order drawn
    from the public `seed`, as int64 chunks of at most `batch_size`; memory is
    O(batch_size + classes) whatever the total, and the order does not depend on torch.

    Each chunk is the next labels of one uniform random permutation of the whole label list,
    never built: an ordered sample without replacement of the labels not drawn yet (indices
    into them, sorted by class, mapped to their class), which is how the rest of a uniform
    permutation is distributed given its beginning. Numpy's `choice` draws it in O(size) even
    from 10⁹ labels (Floyd's algorithm), where its multivariate hypergeometric stops below 10⁹.
    """
    left = np.array([int(c) for c in counts], dtype=np.int64)
    remaining = int(left.sum())
    rng = order_rng(seed)
    while remaining > 0:
        size = min(batch_size, remaining)
        picks = rng.choice(remaining, size=size, replace=False, shuffle=True)
        labels = np.searchsorted(np.cumsum(left), picks, side="right").astype(np.int64)
        left -= np.bincount(labels, minlength=len(left))
        remaining -= size
        yield torch.from_numpy(labels)


def labelled_batches(
    generator: Generator,
    counts: Sequence[int],
    batch_size: int,
    seed: int,
    shuffle: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(records, labels) batches drawn from `generator` for `counts`, latents from `seed`.

    The labels come class by class (`label_chunks`, for images), or with `shuffle` (a table's
    rows) in a random order from `seed` (`shuffled_label_chunks`), so that any slice of the
    output holds a random mix of classes; either way every class gets exactly its count, and
    each record is drawn given its label only."""
    rng = torch.Generator(device=generator.device).manual_seed(seed)
    chunks = (
        shuffled_label_chunks(counts, batch_size, seed)
        if shuffle
        else label_chunks(counts, batch_size)
    )
    for chunk in chunks:
        done = 0
        for images in generator.sample(chunk.to(generator.device), batch_size, rng):
            size = int(images.shape[0])
            yield images, chunk[done : done + size]
            done += size
